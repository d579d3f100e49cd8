"""What each command does end to end, over the stages below it: `trace` and `sweep` record
(capture/), summarize (analysis/), attribute (attribution/) and write their reports (report/)
(flows/trace.py, flows/sweep.py); `diff` compares two sides (flows/diff.py) and `report` gathers its
diffs and runs (flows/report.py), both turning what they are pointed at into summaries
(flows/inputs.py, as `analyze` does, flows/analyze.py); `export-perfetto` analyzes and exports
(flows/export.py). flows/outputs.py names every output a command picks itself; flows/options.py and
flows/engines.py hand the command line what it needs of the stages (the catalog, the summary options,
the run config, the registry). The command line (cli/) calls these; no stage imports them."""
