"""What to do about a repository laid out wrong: the hints behind the errors a new user meets first.

Rules:
- Triton's layout is ``<repository>/<model>/<version>/<model file>`` with an optional
  ``<repository>/<model>/config.pbtxt``; each hint names the path the user has and the path to make.
- A model folder given as the repository (it holds ``config.pbtxt``, a model file, or only numeric
  version folders) is refused at start with the folder to give instead.  A ``model-settings.json`` marks one
  only beside version folders: alone, it is MLServer's layout with the settings at the repository root
  (``mlserver start .``), which loads.
- Hints only add words to an error; they never change what loads.
"""

from __future__ import annotations

from pathlib import Path

#: Files that mark a folder as one model's folder (Triton's default model file names, MLServer's settings).
MODEL_SETTINGS = "model-settings.json"
MODEL_FOLDER_MARKERS = ("config.pbtxt", "model.onnx", "model.py", MODEL_SETTINGS)


def model_folder_given_as_repository(root: Path) -> str:
    """Why ``root`` looks like one model's folder rather than a repository ('' when it does not)."""
    if not root.is_dir():
        return ""
    marker = next((name for name in MODEL_FOLDER_MARKERS if (root / name).is_file()), "")
    folders = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    numeric = [p for p in folders if p.name.isdigit()]
    if marker == MODEL_SETTINGS and not numeric:
        marker = ""  # MLServer's settings at the repository root
    if marker:
        why = f"it holds {marker}"
    elif folders and len(numeric) == len(folders):
        why = "its folders are version folders: " + ", ".join(sorted(p.name for p in numeric)[:3])
    else:
        return ""
    parent = root.parent if root.name and root.name != ".." else root.resolve().parent
    return (
        f"--model-repository {root} looks like one model's folder ({why}), not a repository of models: "
        f"give its parent, --model-repository {parent} (the layout is <repository>/<model>/<version>/model.onnx)"
    )


def missing_version_hint(name: str, model_dir: Path, filename: str) -> str:
    """What to do when no version folder of ``model_dir`` holds ``filename`` ('' when no hint fits)."""
    if (model_dir / filename).is_file():
        return (
            f"found {name}/{filename} outside a version folder: move it to {name}/1/{filename} "
            f"(the layout is <repository>/<model>/<version>/{filename})"
        )
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not versions:
        return f"create the version folder {name}/1/ and put {filename} in it"
    held = sorted(p.name for p in versions[-1].iterdir() if p.is_file())
    if held:
        shown = ", ".join(held[:4])
        return (
            f"{name}/{versions[-1].name}/ holds {shown}: rename the model file to {filename}, or name it in "
            "config.pbtxt with default_model_filename"
        )
    return f"{name}/{versions[-1].name}/ is empty: put {filename} in it"
