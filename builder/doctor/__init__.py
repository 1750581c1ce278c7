"""``python -m builder doctor``: this machine checked for the builds it is asked for.

* :mod:`builder.doctor.report` -- one line per check (OK / WARN / FAIL, what was found, the
  fix), the exit code, the table and JSON forms;
* :mod:`builder.doctor.checks` -- the checks, each asking the module that owns the fact
  (the backends' availability, the engine, the cross toolchain, emulation, auditwheel);
* :mod:`builder.doctor.tls_probe` -- the one-second TLS probe of the index from a container.
"""
