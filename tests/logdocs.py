"""The log lines the docs quote, and the logging calls of floodway's code that can print them.

A quoted line is ``<time> <LEVEL> <logger> <message>`` (the CLI's format) inside a ```log
block. It matches a call when the call logs at that level (``exception`` is ERROR), its logger
has that name, and its %-format, with every placeholder read as "some text", matches the
message whole.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from harness.processes import ROOT

LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+) (?P<logger>[\w.]+)"
    r" (?P<message>.+)$"
)
_PLACEHOLDER = re.compile(r"%(?:\.\d+)?[sdrfgi]")
_LOG_BLOCK = re.compile(r"^[ \t]*```log\n(?P<body>.*?)^[ \t]*```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class LogCall:
    level: str  # as printed: WARNING, ERROR...
    logger: str
    format: str
    where: str  # path:line

    @property
    def pattern(self) -> re.Pattern[str]:
        pieces = _PLACEHOLDER.split(self.format)
        return re.compile("(.+?)".join(re.escape(p) for p in pieces) + r"\Z", re.DOTALL)

    def matches(self, level: str, logger: str, message: str) -> bool:
        return (level, logger) == (self.level, self.logger) and self.pattern.match(
            message
        ) is not None


def log_calls(package: Path = ROOT / "floodway") -> list[LogCall]:
    calls: list[LogCall] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        loggers = _loggers(tree, module)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            target = node.func.value
            if not (isinstance(target, ast.Name) and target.id in loggers):
                continue
            if node.func.attr not in LEVELS or not node.args:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                level = "ERROR" if node.func.attr == "exception" else node.func.attr.upper()
                calls.append(LogCall(level, loggers[target.id], first.value, where))
    return calls


def _loggers(tree: ast.Module, module: str) -> dict[str, str]:
    """Module-level ``NAME = logging.getLogger(...)``: variable -> logger name."""
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "getLogger"):
            continue
        arg = call.args[0] if call.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            name = arg.value
        elif isinstance(arg, ast.Name) and arg.id == "__name__":
            name = module
        else:
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                found[target.id] = name
    return found


def quoted_lines(markdown: str) -> list[str]:
    """Every line of every ```log block (indented blocks included), unindented."""
    return [
        line.strip()
        for block in _LOG_BLOCK.finditer(markdown)
        for line in block["body"].splitlines()
        if line.strip()
    ]


def call_for(line: str, calls: list[LogCall]) -> LogCall | None:
    parsed = LINE.match(line)
    if parsed is None:
        return None
    level, logger, message = parsed["level"], parsed["logger"], parsed["message"]
    return next((c for c in calls if c.matches(level, logger, message)), None)
