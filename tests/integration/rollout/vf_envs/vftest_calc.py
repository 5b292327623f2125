"""An MCP toolset (verifiers serves it over streamable HTTP on loopback, as ``python -m vftest_calc``)."""

import verifiers.v1 as vf


class CalcConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[CalcConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two whole numbers and return their sum."""
        return str(a + b)


if __name__ == "__main__":
    Calc.run()
