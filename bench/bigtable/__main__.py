from bench.bigtable.command import run

run()
