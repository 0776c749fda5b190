"""One licence across the repository: LICENSE is the GNU GPL version 3, and every place that names a licence
(each role's Galaxy metadata, the Python project) names it the same way."""

import glob
import os
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPDX = "GPL-3.0-or-later"


def test_the_license_file_is_the_gpl_version_3():
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as handle:
        head = handle.read(400)
    assert "GNU GENERAL PUBLIC LICENSE" in head and "Version 3, 29 June 2007" in head


def test_every_role_names_the_repository_licence():
    metas = sorted(glob.glob(os.path.join(ROOT, "roles", "*", "meta", "main.yml")))
    roles = [path for path in glob.glob(os.path.join(ROOT, "roles", "*")) if os.path.isdir(path)]
    assert len(metas) == len(roles) >= 13
    found = {}
    for path in metas:
        with open(path, encoding="utf-8") as handle:
            found[os.path.relpath(path, ROOT)] = (yaml.safe_load(handle)["galaxy_info"] or {}).get("license")
    assert {path: licence for path, licence in found.items() if licence != SPDX} == {}


def test_the_python_project_names_the_repository_licence():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    assert project["license"] == {"text": SPDX}
