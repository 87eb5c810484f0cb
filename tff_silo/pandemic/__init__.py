"""Pandemic forecasting (thesis ch. 2, the PETs Prize pandemic track) on the
challenge's own file layout: `files` (schema, reading and writing), `synth` (a
seeded synthetic population, contact network and epidemic in that layout),
`epidemic` (the daily outbreak on the contact graph) and `partition` (the official
partition rules). Specification: `../shared/PANDEMIC.md`."""
