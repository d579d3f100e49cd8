"""What each command does end to end, over the stages below it: `trace` and `sweep` record
(capture/), summarize (analysis/), attribute (attribution/) and write their reports (report/)
(flows/trace.py, flows/sweep.py); `diff`, `report` and `analyze` turn what they are pointed at
into summaries (flows/inputs.py). The command line (cli/) calls these; no stage imports them."""
