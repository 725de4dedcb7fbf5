"""torch in, plain records out: graph walk, variable names, backward observers."""
