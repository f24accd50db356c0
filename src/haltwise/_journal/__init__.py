"""The journal: the store interface (:mod:`.store`), its SQLite and PostgreSQL implementations,
the rows they share, owner identity, and the integrity check. No layer above this one writes SQL."""
