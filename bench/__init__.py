"""The libraries of the measuring commands, one room (sub-package) per command; tools/ parses each
command's arguments into the room's typed config. bench/common/ is what the rooms share, and the
rooms never import each other (pyproject.toml's import contracts)."""
