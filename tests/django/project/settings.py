"""Settings of the test project.

The database is the one of ``$CYCLONE_DJANGO_TEST_DSN`` (a libpq DSN), as ``default``
and again as ``other``; ``lite`` is an in-memory SQLite database that Cyclone refuses.
``CYCLONE`` names the worker's client; its DSN is left to the default database unless
``$CYCLONE_DJANGO_TEST_CYCLONE_DSN`` gives one.
"""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

DSN_ENV = "CYCLONE_DJANGO_TEST_DSN"

_params = conninfo_to_dict(os.environ[DSN_ENV])
_postgres = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": _params.get("dbname", ""),
    "USER": _params.get("user", ""),
    "PASSWORD": _params.get("password", ""),
    "HOST": _params.get("host", ""),
    "PORT": _params.get("port", ""),
}

SECRET_KEY = "tests-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": dict(_postgres),
    "other": dict(_postgres),
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
DATABASE_ROUTERS = ["tests.django.project.routers.DefaultOnly"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "cyclone.contrib.django",
    "tests.django.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.django.project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

CYCLONE = {"APP": "tests.django.project.worker:client"}
if os.environ.get("CYCLONE_DJANGO_TEST_CYCLONE_DSN"):  # CYCLONE["DSN"] set (test_manage)
    CYCLONE["DSN"] = os.environ["CYCLONE_DJANGO_TEST_CYCLONE_DSN"]
