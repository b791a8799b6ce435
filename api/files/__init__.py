"""Files: uploads and a batch's output files (routes, queries, wire types)."""
