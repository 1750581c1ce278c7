"""A tiny torch extension built for CPython's stable ABI (``py_limited_api``): one
``cp39-abi3`` wheel serves every Python from 3.9 on. The builder's tests use it to check that
such a wheel is built once per (arch, torch) and verified on each Python it serves."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="abi3ext",
    version="0.0.1",
    packages=["abi3ext"],
    ext_modules=[
        CppExtension(
            "abi3ext._C",
            ["abi3ext/ext.cpp"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x03090000")],
            extra_compile_args={"cxx": ["-O1", "-g0"]},
            extra_link_args=["-s"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
