"""The data layer: one reader (:mod:`pofe.data.io`) and typed mappings from rows to prompts
(:mod:`~pofe.data.prompts`), preference pairs (:mod:`~pofe.data.preferences`), SFT examples
(:mod:`~pofe.data.sft`), calibration items (:mod:`~pofe.data.calibration`) and ranked
responses (:mod:`~pofe.data.eft`); exports to TRL / alpaca_eval / ``datasets``
(:mod:`~pofe.data.export`). Every command's input goes through here."""

from pofe.data.io import read_located, read_rows
from pofe.errors import DataError

__all__ = ["DataError", "read_located", "read_rows"]
