"""Mnemo's schema: self-provisioning migrations, the embedded database, connection pools."""

from .database import (
    Database,
    SessionConnection,
    create_pool,
    init_connection,
    open_database,
    session_settings,
)
from .embedded import EmbeddedDatabaseError, EmbeddedPostgres
from .migrate import MigrationError, MissingExtensionError, apply_migrations, load_migrations, migrate
from .settings import DatabaseSettings, SettingsError, load_settings, setting

__all__ = [
    "Database",
    "DatabaseSettings",
    "EmbeddedDatabaseError",
    "EmbeddedPostgres",
    "MigrationError",
    "MissingExtensionError",
    "SessionConnection",
    "SettingsError",
    "apply_migrations",
    "create_pool",
    "init_connection",
    "load_migrations",
    "load_settings",
    "migrate",
    "open_database",
    "session_settings",
    "setting",
]
