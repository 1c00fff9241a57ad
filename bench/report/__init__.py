"""`specdrive report`: the registry of published results tables and their rendering (one room that
reads the others' records; no other room imports it)."""
