"""What a cluster run measured: metric snapshots at the batch boundaries (scraped from the processes or
queried from Prometheus) turned into the simulator's raw batch data."""
