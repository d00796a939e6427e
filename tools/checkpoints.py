"""Loading PyTorch checkpoints without running code from them.

torch.load unpickles: a checkpoint can name any importable callable (os.system, builtins.open, ...) and pickle calls
it while loading, so an untrusted .pt file runs code on the machine that opens it. safe_load reads a checkpoint with
torch's restricted unpickler (torch.load(weights_only=True): tensors, storages, dtypes, OrderedDict, and the dicts,
lists, tuples, strings and numbers around them), which refuses any other global before calling it, and turns that
refusal into a ValueError that says why. Weights from elsewhere come as safetensors (tools/pretrained.py parses
those itself: a JSON header and raw arrays, nothing to execute).

torch 1.13 (Debian 12's) has a gap in that unpickler: it knows no BINFLOAT opcode, so any checkpoint holding a
plain Python float (a loss curve, a learning rate: the project's own models/trained_attention*.pt do) fails with
"Unsupported operand 71" although it holds nothing unsafe (torch 2 reads them). Only for that failure, safe_load
reads the file again through Python's own unpickler (every opcode) with find_class restricted to exactly the globals
torch's weights_only allows (torch._weights_only_unpickler._get_allowed_globals, the recipe of the pickle module's
documentation, "Restricting Globals"): the same refusal of every other callable, before it is called.

    sys.path.insert(0, "tools"); from checkpoints import safe_load
    state = safe_load("models/trained_attention.pt")
"""
import pickle
import types

import torch

__all__ = ["safe_load"]


def _allowed():
    from torch import _weights_only_unpickler
    return _weights_only_unpickler._get_allowed_globals()


class _RestrictedUnpickler(pickle.Unpickler):
    """Python's unpickler that resolves only the globals torch's weights_only unpickler allows."""

    def find_class(self, module, name):
        allowed = _allowed()
        full = f"{module}.{name}"
        if full in allowed:
            return allowed[full]
        raise pickle.UnpicklingError(f"global '{full}' is not allowed (weights only: tensors, storages, dtypes, "
                                     "OrderedDict)")


# A pickle "module" for torch's loaders: torch subclasses its Unpickler (adding storage handling, which resolves
# storage types itself and defers every other name to find_class above).
_restricted = types.SimpleNamespace(__name__="checkpoints._restricted", Unpickler=_RestrictedUnpickler,
                                    load=lambda f, **kw: _RestrictedUnpickler(f, **kw).load())


def _restricted_load(path, map_location):
    """torch.load's own readers (zip or legacy format) with the _restricted unpickler. Not through torch.load: torch
    1.13's torch.load replaces any pickle_module it is given by the pickle module itself when weights_only is off
    (measured: a pickled builtins.open ran), so the readers it dispatches to are called directly."""
    from torch import serialization as ser
    with open(path, "rb") as f:
        if ser._is_zipfile(f):
            with ser._open_zipfile_reader(f) as z:
                if ser._is_torchscript_zip(z):
                    raise ValueError(f"{path}: a TorchScript archive, not a checkpoint of tensors")
                return ser._load(z, map_location, _restricted, encoding="utf-8")
        return ser._legacy_load(f, map_location, _restricted, encoding="utf-8")


def _refused(path, e):
    """The ValueError for an UnpicklingError: a refused global says so; anything else is a torn or foreign file."""
    text = str(e).strip()
    why = text.split("WeightsUnpickler error:")[-1].strip() or type(e).__name__
    if "Unsupported class" not in text and "is not allowed" not in text:
        return ValueError(f"{path}: not a readable PyTorch checkpoint ({why})")
    return ValueError(f"{path}: refused: the checkpoint holds more than tensors and plain containers ({why}); "
                      "loading it would build that object, which can run code. Load only checkpoints you trust "
                      "with torch.load(weights_only=False), or re-save the state as tensors")


def safe_load(path, map_location="cpu"):
    """The checkpoint's tensors and plain containers (torch.load with weights_only=True), never a call of anything
    it names: a checkpoint holding anything else (a pickled object or callable) raises ValueError before that
    object is built. A missing file raises FileNotFoundError; a torn or foreign file, ValueError."""
    try:
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            if "Unsupported operand" not in str(e):   # a refused global: the point of weights_only
                raise _refused(path, e) from None
        # torch 1.13's restricted unpickler lacks an opcode (BINFLOAT: a Python float): the same allow-list through
        # Python's full unpickler (see the module docstring).
        try:
            return _restricted_load(path, map_location)
        except pickle.UnpicklingError as e:
            raise _refused(path, e) from None
    except (FileNotFoundError, ValueError):
        raise
    except (RuntimeError, EOFError, OSError, AttributeError, ImportError, TypeError, IndexError, KeyError) as e:
        raise ValueError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {e})") from None
