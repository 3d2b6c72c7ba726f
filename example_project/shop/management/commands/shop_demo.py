"""End-to-end demo: invoices and their jobs commit together, real workers e-mail and charge them
exactly once, and a charge whose answer was lost is neither repeated nor forgotten.

    python example_project/manage.py migrate
    python example_project/manage.py shop_demo

Re-runnable on the same database: every run uses its own invoice numbers and customer and reports
only its own rows.
"""

import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import BackgroundJob, DeliveryState, JobDelivery
from shop.models import Invoice, ProviderCharge
from shop.status import (
    CHARGE_JOB_TYPE,
    JOB_TYPE,
    charge_delivery_key,
    email_delivery_key,
    invoice_jobs,
)

SUBJECT_RE = re.compile(r"^Subject: Invoice (\S+)\s*$", re.MULTILINE)
MESSAGE_ID_RE = re.compile(r"^Message-ID: (\S+)\s*$", re.MULTILINE)


class Command(BaseCommand):
    help = (
        "Create invoices through POST /invoices/ (each enqueues its e-mail and its card charge "
        "in the same transaction), show a rolled-back request leaves nothing behind, run real "
        "workers with --burst and check every invoice was e-mailed and charged exactly once; "
        "then let one charge time out after the provider charged and show that its retry does "
        "not charge again and that shop_reconcile_charges settles it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--invoices", type=int, default=5, help="how many invoices to create (default 5)"
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            help="seconds to wait for each worker to drain the queue (default 120)",
        )

    def handle(self, *args, **options) -> None:
        count: int = options["invoices"]
        if count < 1:
            raise CommandError("--invoices must be at least 1")
        if options["timeout"] <= 0:
            raise CommandError("--timeout must be positive")
        if settings.EMAIL_BACKEND != "django.core.mail.backends.filebased.EmailBackend":
            raise CommandError(
                "shop_demo counts e-mails in EMAIL_FILE_PATH: it needs the "
                "file-based EMAIL_BACKEND of example_project/settings.py"
            )
        self.timeout: float = options["timeout"]
        self.problems: list[str] = []

        run = f"{timezone.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        self.heading(f"demo run {run}")

        created = self.create_invoices(run, count)
        rolled_back = self.rolled_back_request(run)
        self.show_idempotency(created[0]["invoice_id"], created[0]["job_id"])
        self.show_pending([c["job_id"] for c in created] + [c["charge_job_id"] for c in created])
        self.run_worker("5. a real worker process", mode="ok")
        figures = self.report([c["invoice_id"] for c in created])
        timed_out = self.unknown_outcome(run)

        if self.problems:
            for problem in self.problems:
                self.stderr.write(f"   PROBLEM: {problem}")
            raise CommandError(f"demo FAILED: {len(self.problems)} problem(s)")
        self.stdout.write(
            self.style.SUCCESS(
                f"demo OK: {figures['invoices']} invoices, {figures['done']} jobs done, "
                f"{figures['emails']} e-mails, {figures['charges']} charges "
                f"({figures['requests']} provider requests), "
                f"{rolled_back['jobs']} jobs for the rolled-back invoice; "
                f"timed-out charge: {timed_out['charges']} charge, "
                f"{timed_out['requests']} provider request, retry did not charge, "
                f"reconciled to {timed_out['state']}"
            )
        )

    # -- steps -------------------------------------------------------------------------------

    def post_invoice(self, client: Client, body: dict) -> dict:
        response = client.post(reverse("invoices"), body, content_type="application/json")
        data = response.json()
        if response.status_code != 201:
            raise CommandError(f"POST /invoices/ answered {response.status_code}: {data}")
        self.stdout.write(
            f"   invoice {data['number']} (id {data['invoice_id']}, {data['amount']} EUR) "
            f"-> e-mail job {data['job_id']}, charge job {data['charge_job_id']}"
        )
        return data

    def create_invoices(self, run: str, count: int) -> list[dict]:
        self.heading(
            f"1. POST /invoices/ x {count}: each creates an invoice and enqueues its "
            "e-mail and its card charge in one transaction"
        )
        client = Client()
        return [
            self.post_invoice(
                client,
                {
                    "email": f"ada+{run}@shop.example",
                    "name": "Ada Lovelace",
                    "number": f"DEMO-{run}-{i:03d}",
                    "amount": str(Decimal("19.90") * i),
                },
            )
            for i in range(1, count + 1)
        ]

    def rolled_back_request(self, run: str) -> dict:
        self.heading(
            "2. POST /invoices/?fail=1: the view raises after enqueue, so the "
            "transaction rolls back"
        )
        number = f"DEMO-{run}-FAIL"
        response = Client().post(
            reverse("invoices") + "?fail=1",
            {"email": f"ada+{run}@shop.example", "amount": "99.00", "number": number},
            content_type="application/json",
        )
        data = response.json()
        if response.status_code != 500 or not data.get("rolled_back"):
            raise CommandError(
                f"expected a 500 rollback answer, got {response.status_code}: {data}"
            )
        invoice_left = Invoice.objects.filter(number=number).exists() or (
            Invoice.objects.filter(pk=data["invoice_id"]).exists()
        )
        jobs_left = BackgroundJob.objects.filter(
            Q(pk__in=[data["job_id"], data["charge_job_id"]])
            | Q(type__in=[JOB_TYPE, CHARGE_JOB_TYPE], payload__invoice_id=data["invoice_id"])
        ).count()
        self.stdout.write(f"   answer {response.status_code}: {data}")
        self.stdout.write(
            f"   invoice {number} (was id {data['invoice_id']}) in the database: "
            f"{'yes' if invoice_left else 'no'}; "
            f"its jobs (were ids {data['job_id']}, {data['charge_job_id']}): {jobs_left}"
        )
        if invoice_left or jobs_left:
            raise CommandError("the rollback left the invoice or its jobs behind")
        return {"invoice_id": data["invoice_id"], "jobs": jobs_left}

    def show_idempotency(self, invoice_id: int, job_id: int) -> None:
        self.heading("3. enqueue the first invoice's e-mail again with the same idempotency key")
        again = enqueue(
            JOB_TYPE, {"invoice_id": invoice_id}, idempotency_key=email_delivery_key(invoice_id)
        )
        self.stdout.write(
            f"   -> job {again.id}, created={again.created} "
            f"(the existing job {job_id} is returned, no duplicate)"
        )
        if again.id != job_id or again.created:
            raise CommandError(
                f"the idempotency key did not deduplicate: got job {again.id} "
                f"created={again.created}, expected job {job_id}"
            )

    def show_pending(self, job_ids: list[int]) -> None:
        self.heading("4. the queue before the worker runs")
        for job in BackgroundJob.objects.filter(pk__in=job_ids).order_by("id"):
            self.stdout.write(
                f"   job {job.id:>6} {job.type:<18} queue={job.queue:<8} "
                f"state={job.state} attempts={job.attempts}/{job.max_attempts} "
                f"payload={job.payload}"
            )
        for queue in ("emails", "payments"):
            waiting = BackgroundJob.objects.filter(queue=queue, state="pending").count()
            self.stdout.write(f"   pending on queue {queue!r} in total: {waiting}")

    def run_worker(self, heading: str, *, mode: str) -> None:
        """Run ``run_jobqueue --burst`` in a process of its own, the fake provider in ``mode``."""
        manage_py = Path(settings.BASE_DIR) / "manage.py"
        argv = [
            sys.executable,
            str(manage_py),
            "run_jobqueue",
            "--queues",
            "emails,payments",
            "--burst",
        ]
        self.heading(
            f"{heading}: SHOP_FAKE_PROVIDER_MODE={mode} {' '.join(argv[1:])}".replace(
                str(manage_py), "manage.py"
            )
        )
        self.stdout.flush()
        env = {**os.environ, "SHOP_FAKE_PROVIDER_MODE": mode}
        try:
            result = subprocess.run(argv, env=env, timeout=self.timeout, check=False)  # noqa: S603
        except subprocess.TimeoutExpired as exc:
            raise CommandError(f"the worker did not finish within {self.timeout:g}s") from exc
        if result.returncode != 0:
            raise CommandError(f"the worker exited with status {result.returncode}")
        self.stdout.write("   worker exited 0")

    def report(self, invoice_ids: list[int]) -> dict:
        self.heading("6. outcome: every invoice e-mailed once, charged once, paid")
        invoices = list(Invoice.objects.filter(pk__in=invoice_ids).order_by("id"))
        email_jobs = invoice_jobs(invoice_ids)
        charge_jobs = invoice_jobs(invoice_ids, CHARGE_JOB_TYPE)
        sent, message_ids = self.count_emails({invoice.number for invoice in invoices})
        requests = 0
        for invoice in invoices:
            facts = self.invoice_facts(invoice, message_ids)
            email_job, charge_job = email_jobs.get(invoice.pk), charge_jobs.get(invoice.pk)
            self.stdout.write(
                f"   {invoice.number}  e-mail: {self.job_text(email_job)}, "
                f"delivery {facts['email_delivery']}, files={sent[invoice.number]}"
            )
            self.stdout.write(
                f"   {' ' * len(invoice.number)}  charge: {self.job_text(charge_job)}, "
                f"delivery {facts['charge_delivery']}, provider charges={facts['charges']} "
                f"requests={facts['requests']}, paid_at={invoice.paid_at or '-'}"
            )
            requests += facts["requests"]
            if invoice.emailed_at is None:
                self.problem(f"{invoice.number} was not e-mailed")
            if sent[invoice.number] != 1:
                self.problem(f"{invoice.number}: {sent[invoice.number]} e-mails instead of 1")
            if not facts["message_on_file"]:
                self.problem(f"{invoice.number}: the e-mail delivery's Message-ID is in no file")
            for label, job in (("e-mail", email_job), ("charge", charge_job)):
                if job is None or job.state != "done":
                    self.problem(f"{invoice.number}: {label} {self.job_text(job)}")
            self.check_paid(invoice, facts)
            if facts["requests"] != 1:
                self.problem(f"{invoice.number}: {facts['requests']} charge requests instead of 1")
        if len(invoices) != len(invoice_ids):
            self.problem(f"only {len(invoices)} of {len(invoice_ids)} invoices exist")
        done = sum(
            1 for job in (*email_jobs.values(), *charge_jobs.values()) if job.state == "done"
        )
        charges = ProviderCharge.objects.filter(
            idempotency_key__in=[charge_delivery_key(pk) for pk in invoice_ids]
        ).count()
        self.stdout.write(
            f"   e-mail files in {settings.EMAIL_FILE_PATH}: {sum(sent.values())} message(s); "
            f"provider charges: {charges} ({requests} requests) for {len(invoices)} invoices"
        )
        return {
            "invoices": len(invoices),
            "done": done,
            "emails": sum(sent.values()),
            "charges": charges,
            "requests": requests,
        }

    def unknown_outcome(self, run: str) -> dict:
        """One more invoice whose charge times out after the provider charged: not charged
        again by the retry, left unconfirmed, settled by shop_reconcile_charges."""
        self.heading(
            "7. one more invoice; its charge will time out AFTER the provider charged "
            "(the unknown outcome)"
        )
        data = self.post_invoice(
            Client(),
            {
                "email": f"ada+{run}@shop.example",
                "name": "Ada Lovelace",
                "number": f"DEMO-{run}-TIMEOUT",
                "amount": "42.00",
            },
        )
        invoice_id, job_id = data["invoice_id"], data["charge_job_id"]
        key = charge_delivery_key(invoice_id)

        self.run_worker("8. a worker while the provider's answers are lost", mode="timeout-once")
        job = BackgroundJob.objects.get(pk=job_id)
        errors = [f"attempt {e['attempt']}: {e['class']}" for e in job.errors]
        self.stdout.write(
            f"   charge job {job.id}: state={job.state} attempts={job.attempts} "
            f"errors=[{'; '.join(errors)}]"
        )
        self.show_charge(invoice_id, key)
        facts = self.charge_facts(invoice_id, key)
        if facts["state"] != DeliveryState.RECORDED or facts["charges"] != 1 or facts["paid"]:
            self.problem(f"after the timeout, expected recorded/1 charge/unpaid: {facts}")
        if not job.errors or "ProviderTimeout" not in job.errors[0]["class"]:
            self.problem(f"the first attempt of job {job.id} did not fail with ProviderTimeout")

        self.heading("9. wait for the retry to come due (its backoff is at most 0.2s)")
        due = Q(state="done") | Q(state="pending", run_after__lte=Now())
        waited = self.wait_for(
            f"job {job_id} to be due or done",
            lambda: BackgroundJob.objects.filter(due, pk=job_id).exists(),
            deadline=10.0,
        )
        job.refresh_from_db()
        self.stdout.write(
            f"   after {waited:.2f}s: job {job.id} "
            + (
                "is due (state=pending)"
                if job.state == "pending"
                else f"state={job.state}: the first worker already ran the retry"
            )
        )
        self.run_worker(
            "10. a second worker runs the retry, the provider answering again", mode="ok"
        )
        job.refresh_from_db()
        self.stdout.write(f"   charge job {job.id}: state={job.state} attempts={job.attempts}")
        self.show_charge(invoice_id, key)
        facts = self.charge_facts(invoice_id, key)
        if job.state != "done" or job.attempts != 2:
            self.problem(f"the retry: expected job {job.id} done after 2 attempts, {job.state}")
        if facts["state"] != DeliveryState.RECORDED or facts["paid"]:
            self.problem(f"the retry settled or paid an unknown outcome by itself: {facts}")
        if facts["charges"] != 1 or facts["requests"] != 1:
            self.problem(f"the retry asked the provider to charge again: {facts}")

        self.heading(f"11. manage.py shop_reconcile_charges --min-age 0 --invoice {invoice_id}")
        call_command(
            "shop_reconcile_charges",
            "--min-age",
            "0",
            "--invoice",
            str(invoice_id),
            stdout=self.stdout,
            stderr=self.stderr,
        )
        self.show_charge(invoice_id, key)
        facts = self.charge_facts(invoice_id, key)
        invoice = Invoice.objects.get(pk=invoice_id)
        if facts["state"] != DeliveryState.SENT or not facts["paid"]:
            self.problem(f"reconciliation: expected sent and paid: {facts}")
        if facts["reference"] != facts["charge_id"] or invoice.charge_id != facts["charge_id"]:
            self.problem(f"reconciliation: the charge ids disagree: {facts}, {invoice.charge_id}")
        if facts["charges"] != 1 or facts["requests"] != 1:
            self.problem(f"after reconciliation: expected 1 charge, 1 request: {facts}")
        sent, _ = self.count_emails({invoice.number})
        if sent[invoice.number] != 1:
            self.problem(f"{invoice.number}: {sent[invoice.number]} e-mails instead of 1")
        return facts

    # -- helpers ------------------------------------------------------------------------------

    def invoice_facts(self, invoice: Invoice, message_ids: set[str]) -> dict:
        email = JobDelivery.objects.filter(key=email_delivery_key(invoice.pk)).first()
        charge = self.charge_facts(invoice.pk, charge_delivery_key(invoice.pk))
        return {
            **charge,
            "email_delivery": self.delivery_text(email),
            "message_on_file": email is not None and email.provider_reference in message_ids,
            "charge_delivery": f"{charge['state']} {charge['reference'] or ''}".strip(),
        }

    def charge_facts(self, invoice_id: int, key: str) -> dict:
        delivery = JobDelivery.objects.filter(key=key).first()
        charges = list(ProviderCharge.objects.filter(idempotency_key=key))
        invoice = Invoice.objects.get(pk=invoice_id)
        return {
            "state": delivery.state if delivery else None,
            "reference": delivery.provider_reference if delivery else None,
            "charges": len(charges),
            "requests": sum(charge.requests for charge in charges),
            "charge_id": charges[0].charge_id if charges else None,
            "paid": invoice.paid_at is not None,
        }

    def check_paid(self, invoice: Invoice, facts: dict) -> None:
        if facts["state"] != DeliveryState.SENT or invoice.paid_at is None:
            self.problem(f"{invoice.number}: charge {facts['state']}, paid_at={invoice.paid_at}")
        if facts["charges"] != 1:
            self.problem(f"{invoice.number}: {facts['charges']} provider charges instead of 1")
        if not (facts["charge_id"] == facts["reference"] == invoice.charge_id):
            self.problem(
                f"{invoice.number}: charge ids disagree: provider {facts['charge_id']}, "
                f"delivery {facts['reference']}, invoice {invoice.charge_id}"
            )

    def show_charge(self, invoice_id: int, key: str) -> None:
        delivery = JobDelivery.objects.filter(key=key).first()
        charges = list(ProviderCharge.objects.filter(idempotency_key=key))
        invoice = Invoice.objects.get(pk=invoice_id)
        charged = ", ".join(
            f"{c.charge_id} {c.amount} EUR, {c.requests} request(s)" for c in charges
        )
        self.stdout.write(
            f"   delivery {key}: {self.delivery_text(delivery)}; "
            f"provider: {len(charges)} charge(s) [{charged}]; "
            f"invoice paid_at={invoice.paid_at or '-'}"
        )

    @staticmethod
    def delivery_text(delivery: JobDelivery | None) -> str:
        if delivery is None:
            return "none"
        if delivery.state == DeliveryState.RECORDED:
            return "recorded (UNCONFIRMED: outcome unknown)"
        return f"{delivery.state} {delivery.provider_reference}".strip()

    @staticmethod
    def job_text(job: BackgroundJob | None) -> str:
        if job is None:
            return "no job"
        return f"job {job.id} {job.state} {job.attempts}/{job.max_attempts}"

    def wait_for(self, what: str, condition: Callable[[], bool], *, deadline: float) -> float:
        """Poll a database condition until it holds; fail after ``deadline`` seconds."""
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > deadline:
                raise CommandError(f"gave up after {deadline:g}s waiting for {what}")
            time.sleep(0.02)
        return time.monotonic() - started

    def count_emails(self, numbers: set[str]) -> tuple[Counter, set[str]]:
        """How many messages the file-based backend wrote for each of these invoice numbers,
        and the Message-IDs of those messages."""
        sent: Counter = Counter()
        message_ids: set[str] = set()
        folder = Path(settings.EMAIL_FILE_PATH)
        if not folder.is_dir():
            return sent, message_ids
        for path in folder.iterdir():
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            # The file-based backend appends every message of one connection to one file,
            # each followed by a line of dashes.
            for message in text.split("\n" + "-" * 79 + "\n"):
                for number in SUBJECT_RE.findall(message):
                    if number in numbers:
                        sent[number] += 1
                        message_ids.update(MESSAGE_ID_RE.findall(message))
        return sent, message_ids

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def heading(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"== {text}"))
