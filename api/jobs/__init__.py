"""Jobs: routes, queries, wire types, and one job's machinery: submitting, waiting, live event streams."""
