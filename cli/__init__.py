"""The ``zkctl`` command line: thin click commands over the admin client library."""
