"""Named devices, clusters and models, stored as JSON files in ``catalog/data``.

Lookups are lazy (the JSON is read on first use) and forgiving about case,
spaces and underscores; an unknown name raises :class:`CatalogError` that
suggests the closest known names. The catalog returns plain dicts; ``specs``
validates them.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources

from ..errors import CatalogError

_KINDS = ("devices", "clusters", "models")


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


@cache
def _load(kind: str) -> tuple[dict[str, dict], dict[str, str]]:
    text = resources.files(__package__).joinpath("data", f"{kind}.json").read_text(encoding="utf-8")
    entries: dict[str, dict] = json.loads(text)
    index: dict[str, str] = {}
    for key, entry in entries.items():
        if key.startswith("_"):
            continue
        for alias in [key, *entry.get("aliases", [])]:
            index.setdefault(_norm(alias), key)
    return {k: v for k, v in entries.items() if not k.startswith("_")}, index


def _get(kind: str, name: str, field: str) -> dict:
    entries, index = _load(kind)
    key = index.get(_norm(name))
    if key is None:
        close = difflib.get_close_matches(_norm(name), list(index), n=3, cutoff=0.5)
        names = sorted({index[c] for c in close})
        hint = f"; did you mean {', '.join(names)}?" if names else f"; known: {', '.join(sorted(entries))}"
        raise CatalogError(field, f"unknown {kind[:-1]} {name!r}{hint}")
    entry = {k: v for k, v in entries[key].items() if k not in ("aliases", "source", "notes")}
    entry["name"] = key
    return entry


def get_device(name: str, field: str = "hardware.device") -> dict:
    """Data-sheet descriptor of a named device (a dict ready for ``DeviceSpec``)."""
    return _get("devices", name, field)


def get_cluster(name: str, field: str = "hardware.cluster") -> dict:
    """A named cluster: device name, devices per node and link parameters."""
    return _get("clusters", name, field)


def get_model(name: str, field: str = "model") -> dict:
    """Architecture of a named model (a dict ready for ``ModelSpec``)."""
    return _get("models", name, field)


def names(kind: str, sort: bool = True) -> list[str]:
    """All names of ``kind`` ("devices", "clusters" or "models"), sorted, or with ``sort=False`` in the
    catalog's own order (each kind lists a vendor's reference systems before later and derived ones)."""
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}")
    entries = list(_load(kind)[0])
    return sorted(entries) if sort else entries


def device_key(name: str) -> str | None:
    """The catalog's own name of device ``name`` (its name or an alias, case, spaces and punctuation aside), or
    None when the catalog has no such device."""
    return _load("devices")[1].get(_norm(name))


def reference_cluster(device: str) -> str | None:
    """The catalog's first cluster built of ``device`` (a catalog device name or alias), or None: the vendor's
    reference system (DGX A100 for the A100 SXM4 80GB, DGX H100 for the H100 SXM5), since each kind lists
    those before later and derived systems."""
    key = device_key(device)
    if key is None:
        return None
    return next((c for c, entry in _load("clusters")[0].items() if entry.get("device") == key), None)


#: Words a driver puts before a device's name ("NVIDIA H100 PCIe", "Tesla T4", "AMD Instinct MI300X").
_VENDOR_WORDS = ("nvidia ", "tesla ", "amd instinct ", "amd ")


def device_by_reported_name(reported: str) -> str | None:
    """The catalog device whose name or alias is ``reported``, the name a driver gives a device
    (``torch.cuda.get_device_properties(i).name``: ``'NVIDIA H100 80GB HBM3'``, ``'Tesla V100-SXM2-32GB'``),
    or None. Only exact matches (case, spaces and punctuation aside), with or without the vendor's word:
    a near name is another part (``'NVIDIA H100 NVL'`` is not the H100 PCIe), and a MIG slice's name
    (``'... MIG 1g.10gb'``) is not the whole device."""
    index = _load("devices")[1]
    text = reported.strip()
    candidates = [text] + [text[len(w):] for w in _VENDOR_WORDS if text.lower().startswith(w)]
    return next((index[_norm(c)] for c in candidates if _norm(c) in index), None)


def source(kind: str, name: str) -> dict:
    """The raw catalog entry (with its ``sources``/``source`` notes) of a name."""
    entries, index = _load(kind)
    key = index.get(_norm(name))
    if key is None:
        raise CatalogError(kind, f"unknown {kind[:-1]} {name!r}")
    return dict(entries[key])
