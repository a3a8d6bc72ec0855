from hypothesis import settings

pytest_plugins = [
    "tests.fixtures.fix_pg",
    "tests.fixtures.fix_kafka",
    "tests.fixtures.fix_spark",
    "tests.fixtures.fix_registry",
]

# No timing assertions (CI's machines are shared and noisy): hypothesis's per-example
# deadline is off for every test, not only for those that say so; no .hypothesis folder.
settings.register_profile("pgcdc", deadline=None, database=None)
settings.load_profile("pgcdc")
