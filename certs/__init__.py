"""Certificates for egpu's webhook: a private CA and a serving certificate (``issue``), and
the CA put into the webhook configuration's caBundle (``inject``). Used by ``egpu certs``."""
