"""The network roles a run can train, by name: the one table every layer reads.

A role's name is its config key (``model.<role>``, ``optim.<role>``, ...) and its checkpoint keys
(``<role>``, ``optim_<role>``); its short name is the device map's (``g:1,d:0``) and its scalars'
(``train/lr_g``). A role may fall back to another's settings: where a per-network section has no
value for it (no key, or null), it takes that role's, and so do its devices where the device map
does not name it (the aux D takes D's). A role is built as a generator or a discriminator (its
``kind``, which one with a fallback takes from it): the kind decides its ``model.<role>`` section
and its defaults elsewhere (segadv/config/network_sections.py), which has one entry per role.

A role is trained (an optimizer, a GradScaler, a backward) unless its record says not
(``trained=False``: the mean teacher's EMA of G, which the method updates itself); a role may start
as a copy of another's weights (``starts_as``: the teacher starts as G, after G's initial weights are
loaded), and is then saved and restored with the run like any network.

Which roles a run trains is its method's to say (``Method.networks``). A new role is one
:func:`register_role` call (a line of ``ROLES`` below for a built-in one) plus the method that
declares it. torch-free: the methods' declarations and the config read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


# What a role's network is built as: its model section's kind (segadv/config/network_sections.py).
KINDS = ("generator", "discriminator")


@dataclass(frozen=True)
class RoleSpec:
    name: str  # generator, discriminator, ...: its config and checkpoint keys
    short: str  # g, d, ...: the device map's name and its scalars'
    kind: str  # one of KINDS: built as a generator or a discriminator
    falls_back_to: Optional[str] = None  # the role whose settings and devices it takes where it has none
    # False: no optimizer, no GradScaler, no backward and no wrapper's gradient sync (its method
    # updates it: the teacher's EMA); its weights are still saved, restored and planned.
    trained: bool = True
    starts_as: Optional[str] = None  # the role whose initial weights it starts as a copy of, or None
    title: str = ""  # what the config's descriptions call it ("G", "the aux D"); "" : its name

    @property
    def called(self) -> str:
        return self.title or self.name


ROLES: dict[str, RoleSpec] = {}


def register_role(name: str, short: str, falls_back_to: Optional[str] = None, *, kind: Optional[str] = None,
                  trained: bool = True, starts_as: Optional[str] = None, title: str = "") -> RoleSpec:
    """Add a role to the table (a plugin's or a test's: the built-ins are below). Its name and
    short name must be new identifiers, and the roles it falls back to and starts as registered
    already; its ``kind`` is its fallback's unless given (a role without a fallback gives it)."""
    for value in (name, short):
        if not value.isidentifier():
            raise ValueError(f"role names are identifiers, got {value!r}")
    taken = {spec.name for spec in ROLES.values()} | {spec.short for spec in ROLES.values()}
    if name in taken or short in taken:
        raise ValueError(f"role {name!r} ({short}): the name or the short name is taken")
    if falls_back_to is not None and falls_back_to not in ROLES:
        raise ValueError(f"role {name!r} falls back to {falls_back_to!r}, which is not a role")
    if starts_as is not None and starts_as not in ROLES:
        raise ValueError(f"role {name!r} starts as {starts_as!r}, which is not a role")
    if kind is None and falls_back_to is not None:
        kind = ROLES[falls_back_to].kind
    if kind not in KINDS:
        raise ValueError(f"role {name!r}: kind {kind!r}; a role is built as one of {', '.join(KINDS)}")
    ROLES[name] = spec = RoleSpec(name, short, kind, falls_back_to, trained, starts_as, title)
    return spec


def unregister_role(name: str) -> None:
    """Remove a role added by :func:`register_role` (a test's, when it ends)."""
    if any(name in (spec.falls_back_to, spec.starts_as) for spec in ROLES.values()):
        raise ValueError(f"role {name!r}: another role falls back to it")
    del ROLES[name]


register_role("generator", "g", kind="generator", title="G")
register_role("discriminator", "d", kind="discriminator", title="D")
register_role("discriminator_aux", "d_aux", falls_back_to="discriminator", title="the aux D")  # multi-level adaptation's second D
# The mean teacher's EMA of G: G's model settings and devices unless named (t:0), its own autocast
# and compile switch where amp.teacher / compile.teacher say; never trained by a backward.
register_role("teacher", "t", falls_back_to="generator", trained=False, starts_as="generator", title="the mean teacher")


def role(name: str) -> RoleSpec:
    """The role ``name`` (its full name)."""
    try:
        return ROLES[name]
    except KeyError:
        raise KeyError(f"no role {name!r}; roles are {', '.join(ROLES)}") from None


def find_role(name: str) -> Optional[RoleSpec]:
    """The role a user names by its full or short name, or None."""
    return next((spec for spec in ROLES.values() if name in (spec.name, spec.short)), None)


def built_as(name: str) -> str:
    """What ``name``'s network is built as: its kind, ``generator`` or ``discriminator``."""
    return role(name).kind


def setting(section: Any, name: str) -> Any:
    """``name``'s value in a per-network section (``cfg.optim``, ``cfg.compile``, ...): its own, or
    where it has none (no key, or null) the value of the role it falls back to (None at the end)."""
    spec: Optional[RoleSpec] = role(name)
    while spec is not None:
        value = getattr(section, spec.name, None)
        if value is not None:
            return value
        spec = role(spec.falls_back_to) if spec.falls_back_to is not None else None
    return None
