"""The ground floor every room stands on: config loading and ConfigError, the artifacts' typed cards
(meta.json, manifest.json) and fingerprints, the results stamps and the graphs' declared names.
Standard library, numpy and yaml only; it imports no other room."""
