"""The dev cluster's PKI: one CA, the apiserver's and the webhooks' serving certificates, client certificates, SA
keys.

Why generated here: kube-apiserver needs TLS and client-certificate identities for RBAC (admin in
`system:masters`, the controller-manager and scheduler under their own well-known user names), and
a key pair to sign ServiceAccount tokens. Everything is written once per state directory as PEM.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)

#: Client identities: file stem -> (user name, groups).
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    # its own name in the audit log (tests count the operator's writes as kubernetes-admin's)
    "lws-controller": ("specdeploy-dev:lws-controller", ("system:masters",)),
}

APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files in ``<state>/pki``."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def webhook_cert(self) -> Path:
        """The serving certificate of webhooks the dev cluster runs on loopback (the LeaderWorkerSet controller's)."""
        return self.directory / "webhooks.crt"

    @property
    def webhook_key(self) -> Path:
        return self.directory / "webhooks.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def generate(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a fresh CA, serving and client certificates and the SA key pair into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _key()
    ca_name = _name("specdeploy-dev-cluster-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca)

    def leaf(path_cert: Path, path_key: Path, subject: x509.Name, usage: x509.ObjectIdentifier,
             sans: list[x509.GeneralName] | None = None) -> None:
        key = _key()
        builder = (
            _builder(subject, ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(path_key, key)
        _write_cert(path_cert, builder.sign(ca_key, hashes.SHA256()))

    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in APISERVER_DNS]
    for ip in ("127.0.0.1", "10.96.0.1", *extra_ips):
        sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
    leaf(pki.serving_cert, pki.serving_key, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    leaf(pki.webhook_cert, pki.webhook_key, _name("dev-cluster-webhooks"), ExtendedKeyUsageOID.SERVER_AUTH,
         [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    for stem, (user, groups) in CLIENTS.items():
        leaf(pki.client_cert(stem), pki.client_key(stem), _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
