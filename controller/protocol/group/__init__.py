"""The group protocol, sans-IO: how a group's members come to agree on who runs which task."""
