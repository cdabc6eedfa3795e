"""Reading a sweep's space from a YAML, TOML or CSV file, with the line of each
parameter for the errors (see :mod:`paralela.space._forms`, which builds the space).

    .yaml/.yml --_load_yaml--+
    .toml      --_load_toml--+--> (mapping, lines) --sweep_from_dict--> Space, settings
    .csv       --_load_csv------> rows --_from_configurations--------> Space(configurations)

PyYAML and tomllib are imported only when a file of theirs is read.
"""

from __future__ import annotations

import csv
import importlib
import io
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError, MissingExtraError
from paralela.space._checks import _CSV_FLOAT, _EXTENSIONS, _check_name, _Invalid
from paralela.space._forms import (
    _branch_chains,
    _from_configurations,
    space_from_dict,
    sweep_from_dict,
)
from paralela.space._space import Space

__all__ = ["as_space", "load_space", "load_sweep_file", "read_sweep_file"]

_CSV_INT = re.compile(r"[-+]?[0-9]+")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(
            f"Search space file not found: {str(path)!r} (relative paths start at "
            f"{os.getcwd()}). Check the path."
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; give the search space file in it.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason}); save it as UTF-8.") from None


def _yaml() -> Any:
    try:
        return importlib.import_module("yaml")  # no type stubs: typed as Any on purpose
    except ImportError:
        raise MissingExtraError("pyyaml", "sweep", "Reading a YAML search space") from None


def _load_yaml(text: str, path: Path) -> tuple[Any, dict[str, int]]:
    """The document, and the line of each parameter (top level, or under ``params``)."""
    yaml = _yaml()
    # PyYAML follows YAML 1.1, where 1e-5 (no dot) is a string; 1.2 and users say float.
    loader_class: Any = type("_Loader", (yaml.SafeLoader,), {})
    loader_class.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and start is not None:
            context = f" ({context} that starts on line {start.line + 1})"
        raise ConfigError(
            f"{path}{at}: YAML syntax error: {problem}{context or ''}. "
            "Check the indentation and quoting there."
        ) from None
    finally:
        loader.dispose()
    _refuse_duplicate_keys(node, path, yaml)
    lines: dict[str, int] = {}
    for key, value in node.value if isinstance(node, yaml.MappingNode) else ():
        if isinstance(key, yaml.ScalarNode):
            lines.setdefault(key.value, key.start_mark.line + 1)
            _option_lines(key.value, value, lines, yaml)
            if key.value == "params" and isinstance(value, yaml.MappingNode):
                for k, v in value.value:
                    lines[k.value] = k.start_mark.line + 1
                    _option_lines(k.value, v, lines, yaml)
    return data, lines


def _option_lines(name: str, node: Any, lines: dict[str, int], yaml: Any) -> None:
    """The lines of the options of a choice ``name`` and of their parameters, as
    ``name/option`` and ``name/option/param`` (nested choices go deeper)."""
    if not isinstance(node, yaml.MappingNode):
        return
    for key, options in node.value:
        if key.value == "options" and isinstance(options, yaml.MappingNode):
            for option, params in options.value:
                here = f"{name}/{option.value}"
                lines[here] = option.start_mark.line + 1
                for param, spec in params.value if isinstance(params, yaml.MappingNode) else ():
                    lines[f"{here}/{param.value}"] = param.start_mark.line + 1
                    _option_lines(f"{here}/{param.value}", spec, lines, yaml)


def _refuse_duplicate_keys(node: Any, path: Path, yaml: Any) -> None:
    """PyYAML keeps the last of two equal keys without a word; a sweep must not."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, path, yaml)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    raise ConfigError(
                        f"{path}, line {line}: {key.value!r} is given twice (first on line "
                        f"{seen[key.value]}); keep one of them."
                    )
                seen[key.value] = line
            _refuse_duplicate_keys(value, path, yaml)


def _load_toml(text: str, path: Path) -> tuple[Any, dict[str, int]]:
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        tomllib: Any = importlib.import_module(name)
    except ImportError:
        raise MissingExtraError("tomli", "sweep", "Reading a TOML file on Python 3.10") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\s*\(at line (\d+), column (\d+)\)", message)
        at = f", line {found[1]}, column {found[2]}" if found else ""
        problem = message.replace(found[0], "") if found else message
        raise ConfigError(
            f"{path}{at}: TOML syntax error: {problem}. Strings need quotes "
            '(name = "adam"), inline tables braces (lr = {type = "float", ...}).'
        ) from None
    return data, _toml_lines(text)


def _toml_lines(text: str) -> dict[str, int]:
    """The line of each top-level key, ``[name]`` or ``[params.name]`` table, and key
    under ``[params]``: TOML parsers report no positions, so this reads the text."""
    key = r'(?:"([^"]+)"|\'([^\']+)\'|([A-Za-z0-9_-]+))'
    header = re.compile(rf"\s*\[\s*(?:params\s*\.\s*)?{key}\s*\]")
    assignment = re.compile(rf"\s*{key}\s*=")
    lines: dict[str, int] = {}
    table: str | None = ""  # "" the root, "params", or None inside any other table
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            found = header.match(line)
            table = "params" if found and line.split("]")[0].strip("[ ") == "params" else None
            if found and table is None:
                lines.setdefault(next(g for g in found.groups() if g), number)
        elif table is not None and (found := assignment.match(line)):
            lines.setdefault(next(g for g in found.groups() if g), number)
    return lines


def _cell(text: str) -> Any:
    """A CSV value: int, then float, then true/false, else the string itself."""
    if _CSV_INT.fullmatch(text):
        return int(text)
    if _CSV_FLOAT.fullmatch(text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _csv_rows(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """Each row with the line it starts on; a quote left open (which would swallow every
    line after it into one value) or a malformed quote is an error naming that line."""
    reader = csv.reader(io.StringIO(text), strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            problem = str(exc)
            if "unexpected end of data" in problem:  # the file ended inside a quote
                problem = "a quote opened on this line is not closed before the end of the file"
            raise ConfigError(
                f'{path}, line {start}: {problem}; quote a value as "a,b" and double a '
                'quote inside one ("say ""hi""").'
            ) from None
        if reader.line_num > start and any("\n" in cell or "\r" in cell for cell in row):
            raise ConfigError(
                f"{path}, line {start}: a quote opened on this line is not closed before "
                f"line {reader.line_num} (or a value spans lines, which a configuration "
                "cannot); close the quote."
            )
        yield start, row
        start = reader.line_num + 1


def _load_csv(text: str, path: Path) -> Space:
    reader = _csv_rows(text, path)
    header = next(reader, (1, []))[1]
    if not header or not any(h.strip() for h in header):
        raise ConfigError(
            f"{path} is empty; its first line must name the parameters (lr,batch_size,...) "
            "and each following line give one configuration."
        )
    names = [h.strip() for h in header]
    for column, name in enumerate(names, 1):
        if not name:
            raise ConfigError(f"{path}, line 1, column {column}: the header has no name there.")
        if names.index(name) != column - 1:
            raise ConfigError(f"{path}, line 1: column {name!r} appears twice; keep one.")
        try:
            _check_name(name)
        except _Invalid as exc:
            raise ConfigError(
                f"{path}, line 1, column {column} ({name!r}): {exc.problem}"
            ) from None
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for line, row in reader:
        if not any(cell.strip() for cell in row):
            continue  # blank line
        if len(row) != len(names):
            raise ConfigError(
                f"{path}, line {line} (row {len(rows) + 1}): has {len(row)} values but the "
                f"header names {len(names)} columns ({', '.join(names)}); fix that row."
            )
        rows.append({n: _cell(c.strip()) for n, c in zip(names, row, strict=True) if c.strip()})
        lines.append(line)
    if not rows:
        raise ConfigError(
            f"{path} has a header but no configurations; add one per line from line 2 on."
        )
    _check_empty_cells(path, names, rows, lines)
    return _from_configurations(rows, [], str(path))


def _check_empty_cells(
    path: Path, names: list[str], rows: list[dict[str, Any]], lines: list[int]
) -> None:
    """Every row sets every column, except an option's columns (``forest.depth``), which
    are set exactly in the rows that choose the option (see :func:`_branch_chains`)."""
    columns = {n: dict.fromkeys(r[n] for r in rows if n in r) for n in names}
    try:
        chains = _branch_chains(columns)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for number, (line, config) in enumerate(zip(lines, rows, strict=True), 1):
        at = [
            f"{path}, line {line} (row {number}), column {i} ({n})" for i, n in enumerate(names, 1)
        ]
        for where, name in zip(at, names, strict=True):
            if name not in config and name not in chains:
                raise ConfigError(
                    f"{where}: the value is empty; every configuration must set every column "
                    "(but an option's columns, '<option>.<name>', in rows that do not choose it)."
                )
        for where, name in zip(at, names, strict=True):
            chain = chains.get(name, [])
            unmet = next(((c, o) for c, o in chain if config.get(c) != o), None)
            if unmet is None and chain and name not in config:
                choice, option = chain[-1]
                raise ConfigError(
                    f"{where}: the value is empty, but this row chooses {option!r} ({choice} "
                    f"= {option}), whose parameter it is; give it a value."
                )
            if unmet is not None and name in config:
                choice, option = unmet
                raise ConfigError(
                    f"{where}: holds {config[name]!r}, but {choice} is {config.get(choice)!r} "
                    f"here, not {option!r}; the column belongs to option {option!r} and is set "
                    "only in rows that choose it: leave it empty."
                )


def read_sweep_file(path: Path) -> tuple[Space, dict[str, Any]]:
    """See :func:`paralela.space.load_sweep_file`."""
    if path.suffix.lower() not in _EXTENSIONS:
        raise ConfigError(
            f"Cannot tell the format of {str(path)!r} from its extension; use one of: "
            f"{', '.join(_EXTENSIONS)}."
        )
    text = _read_text(path)
    if path.suffix.lower() == ".csv":
        return _load_csv(text, path), {}
    load = _load_toml if path.suffix.lower() == ".toml" else _load_yaml
    data, lines = load(text, path)
    if data is None:
        raise ConfigError(f"{path} is empty; give one entry per parameter.")
    return sweep_from_dict(data, source=str(path), _lines=lines)


def load_sweep_file(path: str | os.PathLike[str]) -> tuple[Space, dict[str, Any]]:
    """The space of a ``.yaml``/``.yml``, ``.toml`` or ``.csv`` file, and the settings
    next to ``params:`` in a wrapped YAML/TOML file (empty otherwise)."""
    return read_sweep_file(Path(path))


def load_space(path: str | os.PathLike[str]) -> Space:
    """The space of a ``.yaml``/``.yml``, ``.toml`` or ``.csv`` file; other settings
    in the file are ignored (:func:`load_sweep_file` returns them)."""
    return load_sweep_file(path)[0]


def as_space(space: Space | Mapping[str, Any] | str | os.PathLike[str]) -> Space:
    """What ``paralela.sweep(space=...)`` accepts: a :class:`Space`, a mapping in the
    file form, or the path of a file."""
    if isinstance(space, Space):
        return space
    if isinstance(space, Mapping):
        return space_from_dict(space)
    if isinstance(space, (str, os.PathLike)):
        return load_space(space)
    raise ConfigError(
        f"space must be a Space, a mapping or a file path, got {type(space).__name__}."
    )
