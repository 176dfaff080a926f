"""One Python range everywhere: 3.10 to 3.13.

- requirements.txt: azure-functions 1.26 below 3.13 (it declares Requires-Python <3.13) and 2.x
  from 3.13 (>=3.13), by environment markers, so that exactly one pin applies on each version;
  azure-functions-runtime (the 3.13 worker's runtime library) on 3.13 only;
- pyproject.toml: requires-python and the classifiers;
- scripts/python-env.sh: the versions the quick-start scripts accept and name in their message;
- infra/main.bicep and infra/functionapp.bicep: pythonVersion's @allowed list, and its default, the
  newest version (Flex Consumption runs 3.10 to 3.13);
- the docs that name the range.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support.infra_helpers import bicep

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]

try:
    import tomllib
except ImportError:             # Python 3.10: setuptools carries the same parser
    from setuptools._vendor import tomli as tomllib


def _requirements(name: str) -> list[Requirement]:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))]


def _applies(requirement: Requirement, python: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"python_version": python,
                                                                       "python_full_version": python + ".0"})


def test_exactly_one_azure_functions_pin_applies_on_each_supported_python():
    requirements = _requirements("requirements.txt")
    pins = [r for r in requirements if r.name == "azure-functions"]
    assert len(pins) == 2, pins
    for python in SUPPORTED:
        applying = [str(r.specifier) for r in pins if _applies(r, python)]
        assert len(applying) == 1, f"Python {python}: azure-functions pins that apply: {applying}"
        expected_major = "2" if python == "3.13" else "1"
        assert applying[0].startswith(f"=={expected_major}."), (python, applying)
    runtime = [r for r in requirements if r.name == "azure-functions-runtime"]
    assert [python for python in SUPPORTED if any(_applies(r, python) for r in runtime)] == ["3.13"]
    # Every other pin applies on every supported version.
    for requirement in requirements:
        if requirement.name not in ("azure-functions", "azure-functions-runtime"):
            assert requirement.marker is None, requirement


def test_the_installed_azure_functions_declares_this_python():
    """The pin the markers chose here is one that declares this interpreter supported (its
    Requires-Python): the evidence for the split at 3.13, read from the installed package."""
    here = "%d.%d" % sys.version_info[:2]
    (pin,) = [r for r in _requirements("requirements.txt") if r.name == "azure-functions" and _applies(r, here)]
    assert metadata.version("azure-functions") == str(pin.specifier).removeprefix("==")
    requires = metadata.metadata("azure-functions")["Requires-Python"]
    assert SpecifierSet(requires).contains(f"{here}.0"), (requires, here)


def test_pyproject_declares_the_same_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specifier = SpecifierSet(project["requires-python"])
    assert [python for python in ["3.8", "3.9", *SUPPORTED, "3.14", "3.15"] if specifier.contains(f"{python}.0")] == SUPPORTED
    classified = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")]
    assert classified == SUPPORTED


def test_the_quick_start_scripts_accept_the_same_range():
    script = (ROOT / "scripts" / "python-env.sh").read_text(encoding="utf-8")
    (cases,) = re.findall(r"^\s*(3\.\d+(?: \| 3\.\d+)*)\) return 0 ;;", script, flags=re.MULTILINE)
    assert cases.split(" | ") == SUPPORTED
    (message,) = re.findall(r'^SUPPORTED_PYTHONS="(.*)"$', script, flags=re.MULTILINE)
    assert re.split(r", | or ", message) == SUPPORTED
    # The 3.13 leg (scripts/test-313.sh) asks for the newest one.
    assert 'require_python313 "$script"' in (ROOT / "scripts" / "test-313.sh").read_text(encoding="utf-8")
    assert '[ "$version" = 3.13 ]' in script and SUPPORTED[-1] == "3.13"


def test_the_bicep_allows_the_same_range_and_defaults_to_the_newest():
    for name in ("main.bicep", "functionapp.bicep"):
        file = bicep(name)
        assert file.decorators("pythonVersion")["allowed"] == SUPPORTED, name
        assert file.parameter_default("pythonVersion") == SUPPORTED[-1], name
    site = bicep("functionapp.bicep").only_resource("Microsoft.Web/sites")[1]
    runtime = site["config"]["properties"]["functionAppConfig"]["runtime"]
    assert runtime == {"name": "python", "version": "pythonVersion"}
    params = bicep("main.bicep").modules["functionApp"]["config"]["params"]
    assert params["pythonVersion"] == "pythonVersion"


def test_the_docs_name_the_same_range():
    text = "\n".join(path.read_text(encoding="utf-8") for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert "3.10 to 3.13" in text
    stale = re.findall(r"[^\n]*(?:3\.10[-–]3\.12|3\.10, 3\.11 or 3\.12|<3\.13,>=3\.10)[^\n]*", text)
    assert not stale, stale


def test_markers_are_evaluated_as_pip_does():
    """The helper above agrees with packaging's own evaluation on this interpreter."""
    marker = Marker('python_version >= "3.13"')
    assert marker.evaluate() == (sys.version_info >= (3, 13))
