"""The HTML report (``vllm-probe report``): one self-contained page of charts, drawn with
Bokeh from what :mod:`vllm_probe.analysis.report` computed. A view, on the floor of
:mod:`vllm_probe.tui`: it lays out, never computes a figure."""
