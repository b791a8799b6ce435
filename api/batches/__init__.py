"""Batches: routes, queries, wire types; a batch file's lines read and checked; its jobs inserted and
published."""
