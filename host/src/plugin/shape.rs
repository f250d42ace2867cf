//! The shape of a component's code, read before it is compiled. The compiler's time
//! and memory grow with the size of each function and of the code as a whole, and a
//! compile cannot be interrupted: so a plugin whose code is bigger than any engine
//! plugin needs is refused before the compiler sees it.

/// Bounds on a component's code, checked before compiling it.
#[derive(Debug, Clone, Copy)]
pub struct ShapeLimits {
    /// Code of all core functions together, in bytes.
    pub code_bytes: usize,
    /// Code of one core function, in bytes.
    pub function_bytes: usize,
    /// Core functions with a body.
    pub functions: usize,
    /// Locals one function declares.
    pub locals: u64,
    /// Core modules in the component.
    pub modules: usize,
}

impl Default for ShapeLimits {
    /// About 10× what the bundled plugins have (see the plugin guide's bounds table).
    fn default() -> Self {
        Self { code_bytes: 2 << 20, function_bytes: 64 << 10, functions: 10_000, locals: 256, modules: 16 }
    }
}

/// What the compiler would get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// Code of all core functions together, in bytes.
    pub code_bytes: usize,
    /// The largest function's code, in bytes.
    pub largest_function: usize,
    /// Core functions with a body.
    pub functions: usize,
    /// The most locals one function declares.
    pub most_locals: u64,
    /// Core modules.
    pub modules: usize,
}

impl Shape {
    /// Reads the shape of `bytes` (a component or a core module) without compiling it.
    pub fn of(bytes: &[u8]) -> Result<Self, String> {
        let mut shape = Shape::default();
        for payload in wasmparser::Parser::new(0).parse_all(bytes) {
            match payload.map_err(|e| e.to_string())? {
                wasmparser::Payload::Version { encoding: wasmparser::Encoding::Module, .. } => shape.modules += 1,
                wasmparser::Payload::CodeSectionEntry(body) => {
                    let size = body.range().len();
                    shape.code_bytes += size;
                    shape.largest_function = shape.largest_function.max(size);
                    shape.functions += 1;
                    let mut locals = 0u64;
                    for entry in body.get_locals_reader().map_err(|e| e.to_string())? {
                        locals += u64::from(entry.map_err(|e| e.to_string())?.0);
                    }
                    shape.most_locals = shape.most_locals.max(locals);
                }
                _ => {}
            }
        }
        Ok(shape)
    }

    /// Every way this shape goes past `limits`, one line each.
    pub fn excess(&self, limits: &ShapeLimits) -> Vec<String> {
        let checks = [
            ("code in all functions", self.code_bytes as u64, limits.code_bytes as u64, " bytes"),
            ("code in one function", self.largest_function as u64, limits.function_bytes as u64, " bytes"),
            ("functions", self.functions as u64, limits.functions as u64, ""),
            ("locals in one function", self.most_locals, limits.locals, ""),
            ("core modules", self.modules as u64, limits.modules as u64, ""),
        ];
        checks
            .into_iter()
            .filter(|(_, found, limit, _)| found > limit)
            .map(|(what, found, limit, unit)| format!("{what}: {found}{unit}, the limit is {limit}{unit}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{CodeSection, Function, FunctionSection, Instruction, Module, TypeSection, ValType};

    fn module(functions: usize, body_instructions: usize, locals: u32) -> Vec<u8> {
        let mut module = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        module.section(&types);
        let mut section = FunctionSection::new();
        (0..functions).for_each(|_| {
            section.function(0);
        });
        module.section(&section);
        let mut code = CodeSection::new();
        for _ in 0..functions {
            let mut f = Function::new([(locals, ValType::I32)]);
            for _ in 0..body_instructions {
                f.instruction(&Instruction::Nop);
            }
            f.instruction(&Instruction::End);
            code.function(&f);
        }
        module.section(&code);
        module.finish()
    }

    #[test]
    fn measures_functions_code_and_locals() {
        let shape = Shape::of(&module(3, 100, 7)).expect("a module");
        assert_eq!(shape.functions, 3);
        assert_eq!(shape.modules, 1);
        assert_eq!(shape.most_locals, 7);
        assert!(shape.largest_function > 100 && shape.largest_function < 110, "{shape:?}");
        assert_eq!(shape.code_bytes, 3 * shape.largest_function);
        assert!(shape.excess(&ShapeLimits::default()).is_empty());
    }

    #[test]
    fn names_every_excess() {
        let limits = ShapeLimits { code_bytes: 250, function_bytes: 90, functions: 2, locals: 5, modules: 1 };
        let excess = Shape::of(&module(3, 100, 7)).expect("a module").excess(&limits);
        assert_eq!(excess.len(), 4, "{excess:?}");
        assert!(excess[1].starts_with("code in one function: 10") && excess[1].ends_with("the limit is 90 bytes"), "{excess:?}");
        assert_eq!(excess[3], "locals in one function: 7, the limit is 5");
    }
}
