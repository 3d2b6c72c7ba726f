from decimal import Decimal

from django import forms


class InvoiceForm(forms.Form):
    email = forms.EmailField()
    amount = forms.DecimalField(max_digits=10, decimal_places=2, min_value=Decimal("0.01"))
    name = forms.CharField(max_length=200, required=False)
    number = forms.CharField(max_length=64, required=False)
