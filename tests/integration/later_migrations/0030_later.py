"""A later migration written against 0029 (the last old file), as other branches write them."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0029_enqueue_statement_work")]

    operations = []
