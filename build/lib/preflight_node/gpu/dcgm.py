# -*- coding: utf-8 -*-
"""Node layer: the results of ``dcgmi diag -r <level> -j``, parsed with json.

Parsing only (``gpu_health.read`` runs dcgmi).  Two layouts are accepted: DCGM 3.x
``{"DCGM GPU Diagnostic": {"test_categories": [...]}}`` and the flat ``{"category": [...]}``; in both a
category holds ``tests`` of ``{name, results: [{gpu_ids | gpu_id, status, info, warnings}]}``.
"""

from __future__ import annotations

import json

STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip",
            "not run": "skip"}
INFO_LIMIT = 300


def _categories(document):
    if not isinstance(document, dict):
        raise ValueError("the JSON is a %s, not an object" % type(document).__name__)
    block = document.get("DCGM GPU Diagnostic", document)
    if not isinstance(block, dict):
        raise ValueError("\"DCGM GPU Diagnostic\" is not an object")
    for key in ("test_categories", "category"):
        if isinstance(block.get(key), list):
            return block[key]
    raise ValueError("no test_categories or category list in the JSON (keys: %s)" % ", ".join(sorted(block)))


def _gpus(result):
    """The GPU indices a result is about: ``gpu_ids`` ("0", "0,1", [0, 1]) or ``gpu_id``; [None] for none."""
    raw = result.get("gpu_ids", result.get("gpu_id"))
    if raw is None or raw == "":
        return [None]
    parts = raw if isinstance(raw, list) else str(raw).split(",")
    found = [int(part) for part in (str(part).strip() for part in parts) if part.isdigit()]
    return found or [None]


def _info(result):
    """What DCGM said about a result: its info and warning texts, joined and trimmed."""
    texts = []
    for key in ("warnings", "info", "errors"):
        value = result.get(key)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                item = item.get("warning") or item.get("message") or item.get("error") or ""
            if item:
                texts.append(str(item).strip())
    return "; ".join(texts)[:INFO_LIMIT]


def parse(text):
    """``[{test, gpu, status, info}]``; raises ValueError when ``text`` is not a dcgmi diag JSON document."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError("not a JSON document (%s)" % exc) from None
    results = []
    for category in _categories(document):
        for test in (category or {}).get("tests") or []:
            for result in test.get("results") or []:
                status = STATUSES.get(str(result.get("status", "")).strip().lower())
                if status is None:
                    raise ValueError("test %r has status %r, not Pass/Fail/Warn/Skip" % (
                        test.get("name"), result.get("status")))
                for gpu in _gpus(result):
                    results.append({"test": str(test.get("name")), "gpu": gpu, "status": status,
                                    "info": _info(result)})
    return results
