"""The commands of scripts/, one module each; scripts/<name> starts them (launch.py)."""
