"""The libraries of the measuring commands, one room (sub-package) per command, named after it
(`specdrive trajectory-cost` -> bench/trajectory_cost/): bench/bench/ serves `specdrive bench`
(its `--drives` option in bench/bench/drives/, its `--stream-breakdown` option beside it),
bench/drive/ `drive`, bench/profile/ `profile` and the `timeline` it renders, bench/roofline/,
bench/plan/, bench/report/. An option of a command lives in its command's room. tools/ parses
each command's arguments into the room's typed config. bench/common/ is what the rooms share,
and the rooms never import each other (pyproject.toml's import contracts)."""
