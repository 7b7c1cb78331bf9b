"""Packages list for setuptools (everything else is in pyproject.toml).

The Hydra config tree is the top-level conf/ directory, shipped as the module `tepo_cli.conf`:
Hydra resolves a console script's config path as a Python module, in editable and wheel installs.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tepo_cli", "tepo_cli.*"]), "tepo_cli.conf"],
    package_dir={"tepo_cli.conf": "conf"},
)
