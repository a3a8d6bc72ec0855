pytest_plugins = [
    "tests.fixtures.fix_pg",
    "tests.fixtures.fix_kafka",
    "tests.fixtures.fix_spark",
    "tests.fixtures.fix_registry",
]
