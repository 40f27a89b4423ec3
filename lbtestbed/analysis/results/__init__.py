"""The result object every source produces (theory, simulation, cluster), its raw batch data, the
statistics that give each estimate its interval, and the tables that print it."""
