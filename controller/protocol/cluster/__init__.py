"""The cluster as a whole, pure: where things live in ZooKeeper, who may touch them, how it is rolled."""
