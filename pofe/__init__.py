"""pofe: preference optimisation from AI feedback.

Stages (one subpackage each): ``generation`` (sampling from a policy), ``judges``
(AI feedback), ``losses`` (direct-alignment losses), ``loops`` (one module per
command: setup -> loop -> save), ``evaluation`` (audit, eval, report, sim),
``data`` (loading prompt/preference files), ``cli``.
"""

__version__ = "0.1.0"
