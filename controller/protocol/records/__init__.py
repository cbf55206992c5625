"""What the product keeps in ZooKeeper, as typed values, and how they become bytes and back."""
