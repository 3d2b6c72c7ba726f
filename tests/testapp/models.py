from django.db import models
from django.db.models.functions import Now


class Effect(models.Model):
    """One row per handler run: the observable side effect tests count."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    worker = models.CharField(max_length=200)
    pid = models.IntegerField()
    at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return f"job {self.job_id} attempt {self.attempt}"


class Invoice(models.Model):
    number = models.CharField(max_length=50, unique=True)

    def __str__(self):
        return self.number


class ProviderCall(models.Model):
    """A call to the fake external provider: one row per effect really performed."""

    key = models.CharField(max_length=300)
    job_id = models.BigIntegerField(null=True)
    attempt = models.IntegerField(default=0)
    at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return self.key


class SerialRun(models.Model):
    """One row per run of the ``serial-record`` job: when it started and finished, per key."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    key = models.CharField(max_length=300)
    pid = models.IntegerField()
    started = models.DateTimeField()
    finished = models.DateTimeField(null=True)

    class Meta:
        db_table = "testapp_serial_run"

    def __str__(self):
        return f"job {self.job_id} key {self.key}"


class StepBody(models.Model):
    """One row per start and per end of a step's body (tests/testapp/step_jobs.py): how tests
    count the runs of each step."""

    job_id = models.BigIntegerField()
    step = models.CharField(max_length=200)
    attempt = models.IntegerField()
    phase = models.CharField(max_length=5)  # "start" or "end"
    pid = models.IntegerField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "testapp_step_body"

    def __str__(self):
        return f"job {self.job_id} step {self.step} {self.phase}"
