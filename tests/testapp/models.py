from django.db import models


class Effect(models.Model):
    """One row per handler run: the observable side effect tests count."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    worker = models.CharField(max_length=200)
    pid = models.IntegerField()
    at = models.DateTimeField(auto_now_add=True)


class Invoice(models.Model):
    number = models.CharField(max_length=50, unique=True)
