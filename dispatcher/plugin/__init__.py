"""`kubectl aw`, the kubectl plugin (dispatcher/plugin/main.py). Imports nothing heavy."""
