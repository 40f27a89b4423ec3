"""``lbt run``'s report: the verdict table, ``report.md``, ``results.json`` and the plots."""
