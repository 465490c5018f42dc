"""Certificates for the TLS tests, made with the cryptography package and written as PEM files.

``make_certificates(directory)`` makes a certificate authority the clients trust, a server
certificate it signed for 127.0.0.1 and localhost, one it signed for another name only (the
name-mismatch case), a client certificate (mutual TLS) and a second CA that signed nothing the
tests serve (the untrusted-CA case). Keys are EC P-256: made in microseconds, and OpenSSL,
Python's ssl and librdkafka all take them. The leaf keys can be encrypted with a password (what
``ssl.key.password`` unlocks); the CAs' keys stay in memory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# A name no certificate but ``wrong_name`` carries, and no resolver answers (RFC 2606).
OTHER_NAME = "broker.invalid"

_VALIDITY = datetime.timedelta(days=30)
# Started in the past, so that a clock a little behind ours still accepts them.
_BACKDATE = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertifiedKey:
    """A certificate and its private key, as PEM files."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    """The PEM files ``make_certificates`` wrote, and the password of the leaf keys (None: clear)."""

    directory: Path
    ca: Path  # what clients trust (ssl.ca.location, ssl.truststore.location)
    server: CertifiedKey  # signed by ``ca`` for IP 127.0.0.1 and DNS localhost
    wrong_name: CertifiedKey  # signed by ``ca`` for OTHER_NAME only
    client: CertifiedKey  # signed by ``ca``, for clientAuth (ssl.certificate.location / ssl.keystore.*)
    untrusted_ca: Path  # a CA that signed none of the above
    key_password: str | None


@dataclass(frozen=True)
class _Authority:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def make_certificates(directory: Path, *, key_password: str | None = None) -> Certificates:
    """Make the test PKI and write it under ``directory`` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _authority("kafka-sidecar test CA")
    untrusted = _authority("kafka-sidecar untrusted CA")

    def write_leaf(stem: str, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> CertifiedKey:
        return CertifiedKey(
            certificate=_write(directory / f"{stem}.pem", certificate.public_bytes(serialization.Encoding.PEM)),
            key=_write(directory / f"{stem}-key.pem", _key_pem(key, key_password)),
        )

    return Certificates(
        directory=directory,
        ca=_write(directory / "ca.pem", ca.certificate.public_bytes(serialization.Encoding.PEM)),
        server=write_leaf("server", *_issue(ca, "localhost", dns=["localhost"],
                                            ips=[ipaddress.ip_address("127.0.0.1")])),
        wrong_name=write_leaf("wrong-name", *_issue(ca, OTHER_NAME, dns=[OTHER_NAME])),
        client=write_leaf("client", *_issue(ca, "kafka-sidecar test client", client=True)),
        untrusted_ca=_write(directory / "untrusted-ca.pem",
                            untrusted.certificate.public_bytes(serialization.Encoding.PEM)),
        key_password=key_password,
    )


def _authority(common_name: str) -> _Authority:
    """A self-signed CA with the extensions strict verifiers (VERIFY_X509_STRICT) ask for."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    certificate = (
        _builder(name, name, public)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Authority(name, key, certificate)


def _issue(ca: _Authority, common_name: str, *, dns: list[str] | None = None,
           ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] | None = None,
           client: bool = False) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a leaf certificate ``ca`` signed: for serverAuth with the given names, or clientAuth."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _builder(subject, ca.name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                              else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns or []]
    names += [x509.IPAddress(ip) for ip in ips or []]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca.key, hashes.SHA256())


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
    """PKCS#8 PEM, encrypted ("ENCRYPTED PRIVATE KEY") when a password is given."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password is not None
        else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
