"""The test command's library: environments, one pytest run per tree, the tables."""
