"""``manage.py bootstrap``: the first admin, with a password that passes the validators."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from tests.conftest import PROJECT, subprocess_env


def test_an_all_digit_password_is_refused():
    with pytest.raises(ValidationError, match="entirely numeric"):
        validate_password("84736251903")


@pytest.mark.parametrize(("password", "reason"), [
    ("84736251903", "This password is entirely numeric."),
    ("short1", "This password is too short."),
    ("password123", "This password is too common."),
])
def test_the_admin_password_from_the_environment_is_validated(db, monkeypatch, password, reason,
                                                              django_user_model):
    monkeypatch.setenv("SPARKOPS_ADMIN_PASSWORD", password)

    with pytest.raises(CommandError, match="SPARKOPS_ADMIN_PASSWORD is not accepted: ") as error:
        call_command("bootstrap")

    assert reason in str(error.value)
    assert "\n" not in str(error.value)
    assert not django_user_model.objects.filter(is_superuser=True).exists()


@pytest.mark.slow
def test_a_refused_admin_password_stops_start_up_with_one_line(tmp_path):
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path), SPARKOPS_ADMIN_PASSWORD="12345678")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=PROJECT,
                   env=env, check=True, capture_output=True, timeout=120)

    result = subprocess.run([sys.executable, "manage.py", "bootstrap"], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=120)

    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "SPARKOPS_ADMIN_PASSWORD" in line]
    assert errors == ["CommandError: SPARKOPS_ADMIN_PASSWORD is not accepted: This password is "
                      "too common. This password is entirely numeric."]
    assert "Traceback" not in result.stderr


def test_a_good_admin_password_creates_the_admin(db, monkeypatch, django_user_model):
    monkeypatch.setenv("SPARKOPS_ADMIN_PASSWORD", "a-long-admin-password-7")

    call_command("bootstrap")

    admin = django_user_model.objects.get(is_superuser=True)
    assert admin.check_password("a-long-admin-password-7")


def test_a_generated_admin_password_is_written_0600(db, monkeypatch, settings, tmp_path,
                                                    django_user_model):
    monkeypatch.delenv("SPARKOPS_ADMIN_PASSWORD", raising=False)
    settings.DATA_DIR = tmp_path
    (tmp_path / "admin-password").write_text("left by an earlier installation\n")

    call_command("bootstrap")

    path = tmp_path / "admin-password"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    admin = django_user_model.objects.get(is_superuser=True)
    assert admin.check_password(path.read_text().strip())
