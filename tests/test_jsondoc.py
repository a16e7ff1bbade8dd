"""The one JSON encoding: what it does with the values JSON has no word for, and that the
writers of kimictl's documents (stdout, run records, vLLM result files) all use it."""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path

import numpy as np
import pytest

from kimictl.commands._output import emit_json
from kimictl.core.jsondoc import dumps
from kimictl.runtime.load.vllm_compat import save_result


class Colour(enum.Enum):
    red = "red"


def test_values_json_lacks_become_valid_json() -> None:
    doc = {"nan": math.nan, "inf": -math.inf, 3: np.float64(0.5), "arr": np.arange(2),
           "path": Path("/tmp/x"), "enum": Colour.red, "text": "café"}  # fmt: skip
    text = dumps(doc).decode()
    assert text.endswith("}\n") and '\n  "nan": null,' in text and "café" in text
    assert json.loads(text) == {"nan": None, "inf": None, "3": 0.5, "arr": [0, 1],
                                "path": "/tmp/x", "enum": "red", "text": "café"}  # fmt: skip
    line = dumps(doc, indent=False)
    assert line.count(b"\n") == 1 and json.loads(line) == json.loads(text)


def test_stdout_and_files_share_the_encoding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = {"completed": 3, "ttft_ms": [1.5, math.nan], "kimictl": {"dropped": True}}
    emit_json(doc)
    assert capsys.readouterr().out == dumps(doc).decode()
    written = save_result(doc, tmp_path / "r.json")
    assert written.read_bytes() == dumps({"completed": 3, "ttft_ms": [1.5, None]}, indent=False)
