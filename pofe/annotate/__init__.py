"""``pofe annotate``: a local web page on which people label pairs, making the human
calibration set that ``pofe audit`` validates a judge against.

rlaif-constitutional-ai, "Choices that matter": validate the judge on 300-1,000
human-labelled pairs before training on it. This package is the labelling side:

* :mod:`pofe.annotate.pairs` reads the pairs to label (any pair file pofe reads) and fixes
  each pair's id and its per-annotator display order;
* :mod:`pofe.annotate.log` is the append-only, fsync'd event log (the calibration file);
* :mod:`pofe.annotate.server` serves the page (``static/``) on loopback with the standard
  library's ``ThreadingHTTPServer``.

``pofe.data.calibration.from_annotations`` turns the log into calibration items.
"""
