"""The project's speed, memory and scale benchmarks (README.md lists their commands).

A regular package, not a namespace one: a package installed under the same name (Opacus's
wheel installs one called `benchmarks`) would otherwise win the import from anywhere on
sys.path, whereas a regular package is found in path order, so the repository root that
`python -m` and pytest put first keeps these."""
