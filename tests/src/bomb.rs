//! Generated components whose code is as big as the shape limits let through, in the
//! patterns that make the compiler work hardest per byte: what a hostile plugin can
//! make the operator's compiler spend.

use plugdb::plugin::ShapeLimits;
use wasm_encoder::{BlockType, CodeSection, Function, FunctionSection, Instruction, Module, TypeSection, ValType};

/// Code patterns, cheapest to dearest to compile.
pub const PATTERNS: [&str; 3] = ["straight", "loops", "branches"];

/// One function body of about `bytes` bytes in `pattern`, using `locals` i64 locals.
fn body(pattern: &str, bytes: usize, locals: u32, seed: u32) -> Function {
    let mut f = Function::new([(locals, ValType::I64)]);
    let mut seed = seed | 1;
    let mut next = |n: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed % n
    };
    let mut size = 0;
    let assign = |f: &mut Function, next: &mut dyn FnMut(u32) -> u32| {
        f.instruction(&Instruction::LocalGet(next(locals)))
            .instruction(&Instruction::LocalGet(next(locals)))
            .instruction(&Instruction::I64Mul)
            .instruction(&Instruction::LocalSet(next(locals)));
        10
    };
    while size < bytes {
        match pattern {
            // Every value live at once: register pressure and spills.
            "straight" => size += assign(&mut f, &mut next),
            // Loops whose bodies redefine locals: block parameters at every header.
            "loops" => {
                f.instruction(&Instruction::Loop(BlockType::Empty));
                for _ in 0..4 {
                    size += assign(&mut f, &mut next);
                }
                f.instruction(&Instruction::LocalGet(next(locals)))
                    .instruction(&Instruction::I32WrapI64)
                    .instruction(&Instruction::BrIf(0))
                    .instruction(&Instruction::End);
                size += 10;
            }
            // A deep nest of blocks left by one wide branch table: many edges.
            _ => {
                let depth = 256;
                for _ in 0..depth {
                    f.instruction(&Instruction::Block(BlockType::Empty));
                }
                size += assign(&mut f, &mut next);
                let targets: Vec<u32> = (0..depth).collect();
                f.instruction(&Instruction::LocalGet(next(locals)))
                    .instruction(&Instruction::I32WrapI64)
                    .instruction(&Instruction::BrTable(targets.into(), 0));
                for _ in 0..depth {
                    size += assign(&mut f, &mut next);
                    f.instruction(&Instruction::End);
                }
                size += 5 * depth as usize;
            }
        }
    }
    f.instruction(&Instruction::End);
    f
}

/// A component holding one core module whose code fills `limits` in `pattern`.
pub fn component(pattern: &str, limits: &ShapeLimits) -> Vec<u8> {
    // A little under the limits: the generator overshoots by up to one step.
    let per_function = limits.function_bytes - (16 << 10);
    let functions = (limits.code_bytes / (per_function + (8 << 10))).min(limits.functions);
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut section = FunctionSection::new();
    for _ in 0..functions {
        section.function(0);
    }
    module.section(&section);
    let mut code = CodeSection::new();
    for n in 0..functions {
        code.function(&body(pattern, per_function, limits.locals as u32, 0x9e37_79b9 ^ n as u32));
    }
    module.section(&code);
    let mut component = wasm_encoder::Component::new();
    component.section(&wasm_encoder::ModuleSection(&module));
    component.finish()
}
