"""Names and paths that come from clients: model names, uploaded file names, file names in configs.

Rules:
- A model name is a name, never a path: not empty, no ``/``, ``\\``, NUL,
  not ``.`` or ``..``, at most NAME_MAX bytes.  It becomes a directory under the
  repository root, so anything else could reach outside it.
- An uploaded file (``file:<version>/<name>``) is a relative path of such names.
- A file name a config gives (``default_model_filename``) is one such name.
- A path built from any of these is resolved (symbolic links included) and
  must still lie inside the model's directory.
- Messages name what the client sent, never the server's own paths.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..errors import InternalError, InvalidArgument

#: Longest file-name component most file systems take (Linux NAME_MAX), in bytes.
NAME_MAX = 255
#: Longest uploaded relative path accepted, in bytes.
UPLOAD_PATH_MAX = 1024


def _name_problem(name: str) -> str:
    """Why ``name`` cannot be one path component, or '' when it can."""
    if not name:
        return "it is empty"
    if "\0" in name:
        return "it contains a NUL character"
    if "/" in name or "\\" in name:
        return "it contains a path separator"
    if name in (".", ".."):
        return f"'{name}' is not a name"
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        return f"it is longer than {NAME_MAX} bytes"
    return ""


#: The characters python_backend refuses in a stub's name (its model's or instance's name: pb_utils.h INVALID_CHARS;
#: the stub's command line is run by a shell).
PYTHON_STUB_INVALID_CHARS = ";|&$`<>()[]{}\\\"'*?~#!"


def check_python_model_name(name: str) -> None:
    """Refuse, with Triton's words, a Python model whose name python_backend would not launch a stub for."""
    if not name or any(char in PYTHON_STUB_INVALID_CHARS for char in name):
        raise InvalidArgument(f"failed to load '{name}': Invalid stub name: contains invalid characters "
                              f"(a Python model's name may not contain any of {PYTHON_STUB_INVALID_CHARS})")


def check_model_name(name: str) -> None:
    """Refuse a model name that is not a plain directory name."""
    problem = _name_problem(name)
    if problem:
        raise InvalidArgument(f"invalid model name {_shown(name)}: {problem}")


def upload_parts(model: str, relative: str) -> tuple[str, ...]:
    """The components of an uploaded file's relative path, checked one by one."""
    where = f"load '{model}': model file 'file:{_shown(relative, quoted=False)}'"
    if len(relative.encode("utf-8", "surrogatepass")) > UPLOAD_PATH_MAX:
        raise _too_long(model, f"{where}: the path is longer than {UPLOAD_PATH_MAX} bytes")
    if relative.startswith("/"):
        raise InvalidArgument(f"{where} must be a relative path inside the model directory")
    parts = tuple(PurePosixPath(relative).parts)
    if not parts:
        raise InvalidArgument(f"{where} must name a file")
    for part in parts:
        problem = _name_problem(part)
        if problem.startswith("it is longer than"):
            raise _too_long(model, f"{where}: {problem}")
        if problem:
            raise InvalidArgument(f"{where} must be a relative path inside the model directory: {problem}")
    return parts


def _too_long(model: str, detail: str) -> InternalError:
    """A name the file system would refuse for its length: Triton's writing fails, INTERNAL, in its words."""
    return InternalError(f"failed to load '{model}', failed to poll from model repository: {detail}")


def check_file_name(model: str, field: str, name: str) -> None:
    """Refuse a config's file name (e.g. ``default_model_filename``) that is not one plain name."""
    problem = _name_problem(name)
    if problem:
        raise InvalidArgument(f"model '{model}': {field} {_shown(name)} must be a file name: {problem}")


def check_inside(model: str, model_dir: Path, path: Path, what: str) -> None:
    """Refuse ``path`` when, resolved (links followed), it is not inside ``model_dir``."""
    base = model_dir.resolve()
    target = path.resolve()
    if target != base and base not in target.parents:
        raise InvalidArgument(f"model '{model}': {what} leads outside the model's directory")


def _shown(text: str, quoted: bool = True) -> str:
    """``text`` as it may appear in a message: control characters escaped, long text cut."""
    shown = text.encode("unicode_escape").decode("ascii")
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"'{shown}'" if quoted else shown
