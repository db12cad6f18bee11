"""The evidence report a PR reviewer reads top-down: the ladder of rungs, strongest evidence first, each
with the reader of its committed result set beside it (one module per rung), and the page they make.

Below kit.pipeline, which runs the 04_report notebook and hands the ladder the batch's pairing of runs;
above kit.compare and kit.analysis, whose summaries and judges it reads. It never imports kit.pipeline or
kit.cli.
"""
