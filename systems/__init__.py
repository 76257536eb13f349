"""The benchmark registry and the schema of systems/<system>.json; imports nothing else of ours."""
